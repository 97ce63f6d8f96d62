# Installation, the CMake package and the relocatable bundle (docs/install.md).
#
# Components:
#   runtime  the programs ddprun, train, bench, scale             (bin/)
#   dev      headers, static libraries, the CMake package ddp     (include/ddp, lib, lib/cmake/ddp)
#   bundle   not part of a plain `cmake --install`: copies the non-system shared
#            libraries the programs need into lib/ and points them at each other
#            ($ORIGIN), so an unpacked tree runs without our -dev packages. `cpack`
#            makes it a .tar.gz (runtime + bundle).
#
# Headers keep the paths users write (#include "runtime/tensor.h",
# "collectives/ddp/distributed_data_parallel.h", "ddp/config.h") under one
# include root, <prefix>/include/ddp, so the generic folder names stay out of
# <prefix>/include.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(DDP_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/ddp CACHE STRING
    "Where the CMake package ddp is installed, relative to the prefix")
set(DDP_INSTALL_INCLUDE_ROOT ${CMAKE_INSTALL_INCLUDEDIR}/ddp)
option(DDP_BUNDLE_CUDA_LIBS
       "Bundle cudart, cuBLAS and NCCL too (off: the target machine provides CUDA)" OFF)

set(DDP_LIBRARY_TARGETS ddp_runtime ddp_collectives ddp_launcher ddp_trainer ddp_models)
set(DDP_PROGRAM_TARGETS ddprun train sample tokenize)
foreach(program bench scale)  # scale: the sweep driver (docs/scaling.md), where it is built
  if(TARGET ${program})
    list(APPEND DDP_PROGRAM_TARGETS ${program})
  endif()
endforeach()

# ---- Library targets as the package exports them -------------------------------
set_target_properties(ddp_runtime PROPERTIES EXPORT_NAME runtime)
set_target_properties(ddp_collectives PROPERTIES EXPORT_NAME collectives)
set_target_properties(ddp_launcher PROPERTIES EXPORT_NAME launcher)
set_target_properties(ddp_trainer PROPERTIES EXPORT_NAME trainer)
set_target_properties(ddp_models PROPERTIES EXPORT_NAME models)
# The static libraries list ddp_warnings as a link-only dependency; CMake needs it
# exported with them. It contributes nothing to a user's link (no link options).
set_target_properties(ddp_warnings PROPERTIES EXPORT_NAME internal_warnings)
target_include_directories(ddp_runtime INTERFACE $<INSTALL_INTERFACE:${DDP_INSTALL_INCLUDE_ROOT}>)
if(DDP_SANITIZE)
  # Installed objects were compiled with -fsanitize: whoever links them needs the runtime.
  set(_ddp_san_link -fsanitize=${DDP_SANITIZE})
  if(DDP_SANITIZE STREQUAL "address")
    list(APPEND _ddp_san_link -fsanitize=undefined)
  endif()
  target_link_options(ddp_runtime INTERFACE "$<INSTALL_INTERFACE:${_ddp_san_link}>")
endif()

# ddp::ddp: everything, for users who do not pick layers.
add_library(ddp_all INTERFACE)
add_library(ddp::ddp ALIAS ddp_all)
set_target_properties(ddp_all PROPERTIES EXPORT_NAME ddp)
target_link_libraries(ddp_all INTERFACE ddp_runtime ddp_collectives ddp_launcher ddp_trainer ddp_models)

# ---- Programs: RUNPATH $ORIGIN/../lib (the bundle's libraries, or the prefix's) ---
file(RELATIVE_PATH _ddp_bin_to_lib /${CMAKE_INSTALL_BINDIR} /${CMAKE_INSTALL_LIBDIR})
set(DDP_PROGRAM_RPATH "$ORIGIN/${_ddp_bin_to_lib}")
set(DDP_BUNDLE_SEARCH_DIRS)
set(DDP_BUNDLE_DLOPEN_LIBS)  # opened on first use, so not in any program's ldd
if(DDP_HAVE_CUDA)
  # cuBLAS and NCCL are opened on first use (Note [vendor libraries on first use]);
  # the programs' RUNPATH is where dlopen looks first: the bundle's lib/, where
  # CUDA is on the build machine, the toolkit's usual place; then ld.so.conf.
  list(APPEND DDP_PROGRAM_RPATH ${CUDAToolkit_LIBRARY_DIR} /usr/local/cuda/lib64)
  list(APPEND DDP_BUNDLE_SEARCH_DIRS ${CUDAToolkit_LIBRARY_DIR})
  list(APPEND DDP_BUNDLE_DLOPEN_LIBS
       ${CUDAToolkit_LIBRARY_DIR}/libcublas.so.${CUDAToolkit_VERSION_MAJOR})
endif()
if(DDP_HAVE_NCCL)
  get_filename_component(_ddp_nccl_dir "${NCCL_LIBRARY}" DIRECTORY)
  list(APPEND DDP_PROGRAM_RPATH ${_ddp_nccl_dir})
  list(APPEND DDP_BUNDLE_SEARCH_DIRS ${_ddp_nccl_dir})
  list(APPEND DDP_BUNDLE_DLOPEN_LIBS ${_ddp_nccl_dir}/libnccl.so.2)
endif()
list(REMOVE_DUPLICATES DDP_PROGRAM_RPATH)
set_target_properties(${DDP_PROGRAM_TARGETS} PROPERTIES INSTALL_RPATH "${DDP_PROGRAM_RPATH}")

# ---- Install rules -------------------------------------------------------------
install(TARGETS ${DDP_PROGRAM_TARGETS} EXPORT ddpPrograms
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime)
install(TARGETS ${DDP_LIBRARY_TARGETS} ddp_all ddp_warnings EXPORT ddpTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev)
# Every header and what headers include (.inc), so each installed header compiles
# from the install alone (tests/e2e/install_package.sh compiles every one). Not
# installed: the headers of the vendor backends, which include the vendor SDK's
# own headers (cuda_runtime.h, cublas_v2.h, cublasLt.h, cudnn_graph.h, nccl.h; also
# cublas_handle.h, which includes cublas_library.h, and sdpa_cudnn_internal.h, which
# includes cudnn_library.h) that the package does not
# promise; only the implementation includes them. Nor the emulated CUDA device's
# (runtime/cuda/emu: it includes cuda_runtime.h, and only the emulated kernels use it).
foreach(layer runtime collectives launcher trainer models)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/${layer} DESTINATION ${DDP_INSTALL_INCLUDE_ROOT}
          COMPONENT dev FILES_MATCHING PATTERN "*.h" PATTERN "*.inc"
          PATTERN "cuda_check.h" EXCLUDE PATTERN "cublas_library.h" EXCLUDE
          PATTERN "cublaslt_library.h" EXCLUDE PATTERN "cudnn_library.h" EXCLUDE
          PATTERN "sdpa_cudnn_internal.h" EXCLUDE
          PATTERN "nccl_library.h" EXCLUDE PATTERN "cublas_handle.h" EXCLUDE
          PATTERN "emu" EXCLUDE)
endforeach()
install(FILES ${PROJECT_BINARY_DIR}/generated/ddp/config.h
        DESTINATION ${DDP_INSTALL_INCLUDE_ROOT}/ddp COMPONENT dev)
# The PyTorch peer that `scale --impls torch` runs, in the source tree's layout
# (torch_train.py imports ../../models/torch_models.py).
install(FILES ${PROJECT_SOURCE_DIR}/bench/peer/torch_train.py
        DESTINATION ${CMAKE_INSTALL_DATADIR}/ddp/bench/peer COMPONENT runtime)
install(FILES ${PROJECT_SOURCE_DIR}/models/torch_models.py
        DESTINATION ${CMAKE_INSTALL_DATADIR}/ddp/models COMPONENT runtime)
# The checkpoint reader for PyTorch users (no safetensors package needed): an
# importable module, and the same file as the program ddp-load (docs/checkpoints.md).
install(FILES ${PROJECT_SOURCE_DIR}/python/ddp_checkpoint.py
        DESTINATION ${CMAKE_INSTALL_DATADIR}/ddp/python COMPONENT runtime)
install(PROGRAMS ${PROJECT_SOURCE_DIR}/python/ddp_checkpoint.py
        DESTINATION ${CMAKE_INSTALL_BINDIR} RENAME ddp-load COMPONENT runtime)

install(EXPORT ddpTargets NAMESPACE ddp:: DESTINATION ${DDP_INSTALL_CMAKEDIR} COMPONENT dev)
# ddp::ddprun, ddp::train, ddp::bench; ddpConfig.cmake loads them only where bin/ddprun is installed.
install(EXPORT ddpPrograms NAMESPACE ddp:: DESTINATION ${DDP_INSTALL_CMAKEDIR} COMPONENT dev)
configure_package_config_file(cmake/ddpConfig.cmake.in ${PROJECT_BINARY_DIR}/ddpConfig.cmake
                              INSTALL_DESTINATION ${DDP_INSTALL_CMAKEDIR} PATH_VARS CMAKE_INSTALL_BINDIR)
# 0.x: a minor version may break the API.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/ddpConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/ddpConfig.cmake ${PROJECT_BINARY_DIR}/ddpConfigVersion.cmake
              ${PROJECT_SOURCE_DIR}/cmake/FindNCCL.cmake ${PROJECT_SOURCE_DIR}/cmake/FindOneDNN.cmake
        DESTINATION ${DDP_INSTALL_CMAKEDIR} COMPONENT dev)

# ---- The bundle ------------------------------------------------------------------
install(CODE "
  set(DDP_BUNDLE_PROGRAMS \"${DDP_PROGRAM_TARGETS}\")
  set(DDP_BUNDLE_BINDIR \"${CMAKE_INSTALL_BINDIR}\")
  set(DDP_BUNDLE_LIBDIR \"${CMAKE_INSTALL_LIBDIR}\")
  set(DDP_BUNDLE_SEARCH_DIRS \"${DDP_BUNDLE_SEARCH_DIRS}\")
  set(DDP_BUNDLE_CUDA_LIBS ${DDP_BUNDLE_CUDA_LIBS})
  set(DDP_BUNDLE_DLOPEN_LIBS \"${DDP_BUNDLE_DLOPEN_LIBS}\")
  include(\"${PROJECT_SOURCE_DIR}/cmake/bundle_runtime_deps.cmake\")
" COMPONENT bundle EXCLUDE_FROM_ALL)

set(CPACK_PACKAGE_NAME ddp)
set(CPACK_PACKAGE_VENDOR ddp)
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "ddp: data-parallel training runtime (programs and their libraries)")
set(CPACK_GENERATOR TGZ)
set(CPACK_SOURCE_GENERATOR "")
set(_ddp_flavor cpu)
if(DDP_HAVE_CUDA)
  set(_ddp_flavor cuda)
endif()
set(CPACK_PACKAGE_FILE_NAME "ddp-${PROJECT_VERSION}-linux-${CMAKE_SYSTEM_PROCESSOR}-${_ddp_flavor}")
# Programs without their debug information: a third of the size. Debug builds
# come from the build tree or a plain `cmake --install`.
set(CPACK_STRIP_FILES ON)
# The tarball holds one folder, ddp-<version>-...; it runs from wherever it is unpacked.
set(CPACK_INCLUDE_TOPLEVEL_DIRECTORY ON)
set(CPACK_INSTALL_CMAKE_PROJECTS "${PROJECT_BINARY_DIR};ddp;runtime;/" "${PROJECT_BINARY_DIR};ddp;bundle;/")
include(CPack)
