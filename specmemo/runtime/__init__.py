"""What ships to a device: the artifact read back, the plan, the arena, the sessions, the drafters, the controller and
the decode loop (numpy, onnxruntime and tokenizers only; docs/architecture.md has its rooms)."""
