"""The IR (HloModuleProto I/O and the graph view) and the rewrite passes over it."""
