# FindOneDNN
# ----------
# Finds oneDNN (libdnnl, Debian's libdnnl-dev), the library behind ddp's CPU
# convolutions when present (docs/building.md).
#
# Our own module rather than oneDNN's dnnl-config.cmake: Debian's config requires
# the OpenCL development files (its GPU runtime) with REQUIRED, so on a machine
# without them even a QUIET find_package(dnnl) stops the configure. ddp uses the
# CPU engine only and links libdnnl directly.
#
# Looks in OneDNN_ROOT / $DNNLROOT and the system paths.
# Result: OneDNN_FOUND, OneDNN_VERSION, OneDNN_INCLUDE_DIR, OneDNN_LIBRARY and the
# imported target OneDNN::dnnl.

set(_onednn_hints ${OneDNN_ROOT} $ENV{OneDNN_ROOT} $ENV{DNNLROOT})
find_path(OneDNN_INCLUDE_DIR oneapi/dnnl/dnnl.hpp HINTS ${_onednn_hints} PATH_SUFFIXES include)
find_library(OneDNN_LIBRARY NAMES dnnl HINTS ${_onednn_hints} PATH_SUFFIXES lib lib64)

set(_onednn_version_h "${OneDNN_INCLUDE_DIR}/oneapi/dnnl/dnnl_version.h")
if(OneDNN_INCLUDE_DIR AND EXISTS "${_onednn_version_h}")
  file(STRINGS "${_onednn_version_h}" _onednn_ver REGEX "^#define DNNL_VERSION_(MAJOR|MINOR|PATCH) +[0-9]+")
  string(REGEX REPLACE ".*DNNL_VERSION_MAJOR +([0-9]+).*" "\\1" _maj "${_onednn_ver}")
  string(REGEX REPLACE ".*DNNL_VERSION_MINOR +([0-9]+).*" "\\1" _min "${_onednn_ver}")
  string(REGEX REPLACE ".*DNNL_VERSION_PATCH +([0-9]+).*" "\\1" _pat "${_onednn_ver}")
  set(OneDNN_VERSION "${_maj}.${_min}.${_pat}")
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(OneDNN
  REQUIRED_VARS OneDNN_LIBRARY OneDNN_INCLUDE_DIR
  VERSION_VAR OneDNN_VERSION)

if(OneDNN_FOUND AND NOT TARGET OneDNN::dnnl)
  add_library(OneDNN::dnnl UNKNOWN IMPORTED)
  set_target_properties(OneDNN::dnnl PROPERTIES
    IMPORTED_LOCATION "${OneDNN_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${OneDNN_INCLUDE_DIR}")
endif()
mark_as_advanced(OneDNN_INCLUDE_DIR OneDNN_LIBRARY)
