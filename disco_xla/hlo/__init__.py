"""The IR: HloModuleProto messages and I/O, HLO text, the graph view over a
parsed module, and the analyses that read it (FLOPs, gradients, loop trip
counts, the summary `disco-xla inspect` prints). It changes nothing; the
rewrite passes are `disco_xla.hlo_passes`."""
