"""Loaders: the resumable train loader, the evaluation loaders, and the checkpoint layout of the data state."""
