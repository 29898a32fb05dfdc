"""Import-only package for ``torchvision.transforms.functional``."""
