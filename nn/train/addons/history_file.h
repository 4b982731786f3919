// The per-epoch history beside a checkpoint: <dir>/history.jsonl, one JSON line per epoch
// (nn::epoch_record_json), appended at the end of each epoch.
//
// Why a file of its own: last.safetensors is rewritten after every epoch. With the history inside it,
// that file grew by one record per epoch, and a run that checkpoints every epoch paid a cost that grew
// with the square of its length. Appending one line costs the same at epoch 4000 as at epoch 1, and
// the checkpoint keeps one size however long the run.
//
// At the end of an epoch the line is appended (and synced) before last.safetensors is written. A
// crash between the two leaves a line for an epoch the checkpoint does not hold, and a crash in the
// middle of the append leaves half a line: on resuming, read_history keeps the records of the epochs
// the checkpoint holds, and rank 0 rewrites the file with exactly those (atomically), so the epoch
// that runs again adds its line once.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tinyddp/nn/train/trainer.h"

namespace tinyddp::nn {

// Appends the record as one line and syncs it to disk. Throws tinyddp::Error when it cannot.
void append_history_line(const std::string& path, const EpochRecord& record);

// The records of epochs 0 .. epochs_done - 1 in the file, in epoch order: a record of a later epoch
// and a last line cut short are left out; any other line that does not parse is an error naming the
// file and the line. A missing file is an empty history.
std::vector<EpochRecord> read_history(const std::string& path, int64_t epochs_done);

// Replaces the file with these records (a temporary file, synced, renamed over it).
void write_history(const std::string& path, const std::vector<EpochRecord>& records);

}  // namespace tinyddp::nn
