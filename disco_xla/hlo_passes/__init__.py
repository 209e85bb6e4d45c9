"""The rewrite passes over the IR (`disco_xla.hlo`), each a small unit with one
job (`pass_interface`)."""
