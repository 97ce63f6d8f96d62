// Precompiled once per library (Note [precompiled headers] in CMakeLists.txt): the
// standard library, fmt and spdlog headers that most of ddp's sources include.
// Nothing here is ddp's own API; every source still includes what it uses.
#pragma once

#include "runtime/fmt.h"  // before spdlog: Note [fmt's engine in every object]

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <sstream>
#include <string>
#include <thread>
#include <unordered_map>
#include <variant>
#include <vector>
