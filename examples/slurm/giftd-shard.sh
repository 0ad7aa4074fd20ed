#!/bin/bash
# giftd-shard.sh: one giftd shard as a task of the Slurm step that
# giftd-hetjob.sbatch starts over its CPU component. The shard id is the
# task's rank in the step, its ports follow from its local id on the node,
# and its data_dir (checkpoints) is RUN_DIR/shard-ID on the shared file system,
# so a requeued job finds it again. GIFTD_NUM_SHARDS, GIFTD_WORLD_SIZE and
# GIFT_AUTH_KEY_FILE come from the batch script.
set -euo pipefail
export GIFTD_SHARD_ID=$SLURM_PROCID
export GIFTD_BIND=0.0.0.0
export GIFTD_PORT=$(( ${BASE_PORT:-7070} + 2 * SLURM_LOCALID ))
export GIFTD_HTTP_PORT=$(( GIFTD_PORT + 1 ))
export GIFTD_DATA_DIR=${GIFT_RUN_DIR:?}/shard-$GIFTD_SHARD_ID
export GIFTD_CHECKPOINT_STEPS=${GIFTD_CHECKPOINT_STEPS:-100}
export GIFTD_AUTH_KEY_FILE=${GIFT_AUTH_KEY_FILE:?}
mkdir -p "$GIFTD_DATA_DIR"
exec "${GIFTD_BIN:-giftd}"
