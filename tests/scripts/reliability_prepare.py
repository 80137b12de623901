"""Run ``TextDataModule.prepare_data`` for one source preprocessed by ``reliability_fns.slow_tokenize``.

Usage: python reliability_prepare.py DATA_FILE CACHE_DIR
Prints one JSON line: ``{"pid", "rows"}`` (rows of the cache ``setup`` then loads). With
``RELIABILITY_LOG``/``RELIABILITY_SLEEP`` set, preprocessing logs this pid and sleeps, so a test
can kill this process mid-build or start a second one while the first is building.
"""

import json
import os
import sys

from lightning_tune_data import LocalDatasetManager, TextDataModule


def make_datamodule(data_file: str, cache_dir: str) -> TextDataModule:
    source = LocalDatasetManager(data_files=data_file, preprocess_function="reliability_fns.slow_tokenize")
    return TextDataModule(dataset_managers={"train": {"src": source}}, cache_dir=cache_dir)


if __name__ == "__main__":
    datamodule = make_datamodule(sys.argv[1], sys.argv[2])
    datamodule.prepare_data()
    source = datamodule.dataset_managers["train"]["src"]
    print(json.dumps({"pid": os.getpid(), "rows": len(source.setup(datamodule.tokenizer, sys.argv[2]))}))
