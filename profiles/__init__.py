"""Build profiles (*.toml), shipped as package data; this marker makes them importable resources."""
