#!/bin/bash
# Tokenize every source of a fit config into its stores with a Slurm job array, one task per
# array element. Each element reads SLURM_ARRAY_TASK_ID / SLURM_ARRAY_TASK_COUNT, writes its part
# of every store and a done-marker; the element that finishes last commits the stores. Rerunning
# the array (or only the failed elements) redoes only what did not finish.
#
#   sbatch --array=0-63 examples/prepare_slurm_array.sh configs/my_fit.yaml
#   # afterwards, if some elements failed and you want to see which:
#   lightning-tune-data prepare --config configs/my_fit.yaml --finalize
#
#SBATCH --job-name=prepare-tokens
#SBATCH --cpus-per-task=8
#SBATCH --mem=32G
#SBATCH --time=04:00:00
#SBATCH --output=prepare-%A_%a.out
set -euo pipefail
config="${1:?usage: sbatch --array=0-N examples/prepare_slurm_array.sh CONFIG.yaml}"
exec lightning-tune-data prepare --config "$config"
