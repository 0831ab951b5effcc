"""Suite-wide pytest configuration."""
