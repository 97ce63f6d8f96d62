// Precompiled once per GoogleTest binary (Note [precompiled headers] in
// CMakeLists.txt): GoogleTest and the headers of cmake/pch.h.
#pragma once

#include "cmake/pch.h"

#include <gtest/gtest.h>
