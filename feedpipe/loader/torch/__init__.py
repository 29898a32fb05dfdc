"""The PyTorch DataLoader backend and its on-device JPEG decode."""
