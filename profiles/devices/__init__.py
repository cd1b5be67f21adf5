"""Device specs (*.toml) with a source URL per number; shipped as package data."""
