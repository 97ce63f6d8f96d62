// The sweep's CSV: one row per measurement, a header naming the columns.
//
//   impl,model,scaling,backend,bucket_cap_mb,world_size,batch_per_rank,global_batch,
//   steps,threads,repeat,samples_per_s,step_ms,comm_exposed_ms,efficiency,load1,timestamp,
//   tokens_per_s
// (tokens_per_s: gpt models, 0 otherwise; files without the column read as 0). A
// gpt spec's commas are written as ';' in the model column.
//
// Reading goes by column name, so files with extra columns (or columns in
// another order) still resume; a missing column or a bad value is a ValueError
// naming the line and column. Values never contain commas or quotes (they are
// flag values checked by validate(), with a gpt spec's commas as ';', and
// numbers), so no quoting is needed.
#pragma once

#include "bench/scale/sweep.h"

#include <string>
#include <string_view>
#include <vector>

namespace ddp::scaling {

std::string csv_header();  // without the newline
std::string csv_row(const Measurement& m);
// The whole file: the header and one row per measurement, each ending in '\n'.
std::string csv_text(const std::vector<Measurement>& measurements);

// Parses a whole file written by csv_text (empty text: no measurements).
std::vector<Measurement> parse_csv(std::string_view text);

}  // namespace ddp::scaling
