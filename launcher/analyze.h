// `ddprun analyze DIR`: the hang diagnosis (Note [hang diagnosis]) and the
// straggler report (Note [straggler report]) from saved flight recorder dumps,
// the same lines ddprun prints in its failure summary.
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace ddp::launcher {

// args: what follows "analyze". Returns the exit status: 0 when the dumps were
// read and diagnosed, 1 when they cannot be read, 2 for a usage error.
int run_analyze(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace ddp::launcher
