"""Generated protobuf/gRPC code (scripts/gen_proto); never edit by hand."""
