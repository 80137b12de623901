"""Tests of ``lightning_tune_data.sources`` (a package, so its module names cannot clash with other folders')."""
