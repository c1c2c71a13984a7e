"""Host tooling, torch side: a Hugging Face or GGUF model exported to an artifact folder, validated against PyTorch;
Medusa heads and feature drafters trained and exported."""
