# Runs at install time (component bundle, cmake/install.cmake): copies the shared
# libraries the installed programs need into <prefix>/lib, except the ones every
# Linux target has (glibc) and, unless DDP_BUNDLE_CUDA_LIBS, the CUDA ones the
# target's CUDA installation provides (cuBLAS and NCCL, opened on first use; the
# CUDA runtime is linked statically); then gives each copied library the
# RUNPATH $ORIGIN, so libraries they load in turn (libgfortran under OpenBLAS,
# Open MPI's libopen-pal under libmpi) are found next to them too.
#
# The programs already carry RUNPATH $ORIGIN/../lib from the link (INSTALL_RPATH).
# Note [bundle runpath]: RUNPATH, not RPATH: LD_LIBRARY_PATH still wins, so a
# cluster's own Open MPI (libmpi.so.40) can replace the bundled one.
cmake_minimum_required(VERSION 3.21)  # file(COPY_FILE), file(GET_RUNTIME_DEPENDENCIES)

set(_prefix "$ENV{DESTDIR}${CMAKE_INSTALL_PREFIX}")
set(_libdir "${_prefix}/${DDP_BUNDLE_LIBDIR}")

set(_programs)
foreach(p IN LISTS DDP_BUNDLE_PROGRAMS)
  set(_exe "${_prefix}/${DDP_BUNDLE_BINDIR}/${p}")
  if(NOT EXISTS "${_exe}")
    message(FATAL_ERROR "bundle: ${_exe} is not installed; install the runtime component first "
                        "(cmake --install BUILD --component runtime --prefix ${_prefix}), or use cpack")
  endif()
  list(APPEND _programs "${_exe}")
endforeach()

find_program(_patchelf patchelf)
if(NOT _patchelf)
  message(FATAL_ERROR "bundle: patchelf is needed to set RUNPATH $ORIGIN on the bundled libraries; "
                      "apt-get install patchelf (deploy/install-deps.sh installs it)")
endif()

# glibc's libraries and the dynamic loader: the target's own must be used.
set(_system_libs
  "^ld-linux" "^linux-vdso" "^libc\\.so" "^libm\\.so" "^libmvec\\.so" "^libdl\\.so"
  "^libpthread\\.so" "^librt\\.so" "^libresolv\\.so" "^libutil\\.so" "^libanl\\.so"
  "^libnsl\\.so" "^libnss_" "^libthread_db\\.so" "^libBrokenLocale\\.so" "^libc_malloc_debug\\.so")
# The NVIDIA driver's libraries always come from the target.
list(APPEND _system_libs "^libcuda\\.so" "^libnvidia-")
if(NOT DDP_BUNDLE_CUDA_LIBS)
  list(APPEND _system_libs "^libcudart\\.so" "^libcublas\\.so" "^libcublasLt\\.so" "^libnccl\\.so")
endif()

# cuBLAS and NCCL are opened on first use, so no program lists them: with
# DDP_BUNDLE_CUDA_LIBS they (and what they load, cublasLt) are added by name.
set(_dlopened)
if(DDP_BUNDLE_CUDA_LIBS)
  foreach(lib IN LISTS DDP_BUNDLE_DLOPEN_LIBS)
    if(NOT EXISTS "${lib}")
      message(FATAL_ERROR "bundle: ${lib} does not exist; DDP_BUNDLE_CUDA_LIBS needs it")
    endif()
    list(APPEND _dlopened "${lib}")
  endforeach()
endif()
set(_libraries_arg)
if(_dlopened)
  set(_libraries_arg LIBRARIES ${_dlopened})
endif()
file(GET_RUNTIME_DEPENDENCIES
  EXECUTABLES ${_programs}
  ${_libraries_arg}
  RESOLVED_DEPENDENCIES_VAR _deps
  UNRESOLVED_DEPENDENCIES_VAR _unresolved
  PRE_EXCLUDE_REGEXES ${_system_libs}
  DIRECTORIES ${DDP_BUNDLE_SEARCH_DIRS})
if(_unresolved)
  message(FATAL_ERROR "bundle: cannot find ${_unresolved}, needed by ${DDP_BUNDLE_PROGRAMS}")
endif()
list(APPEND _deps ${_dlopened})
list(REMOVE_DUPLICATES _deps)

file(MAKE_DIRECTORY "${_libdir}")
foreach(dep IN LISTS _deps)
  # The resolved path's name is the soname the programs ask for; COPY_FILE reads
  # through symlinks (Debian's alternatives for libopenblas.so.0 included).
  get_filename_component(_name "${dep}" NAME)
  set(_dest "${_libdir}/${_name}")
  message(STATUS "Bundling: ${_dest} (from ${dep})")
  file(COPY_FILE "${dep}" "${_dest}")
  execute_process(COMMAND "${_patchelf}" --set-rpath "$ORIGIN" "${_dest}"
                  RESULT_VARIABLE _rc ERROR_VARIABLE _err)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "bundle: patchelf --set-rpath on ${_dest} failed: ${_err}")
  endif()
endforeach()
list(LENGTH _deps _count)
message(STATUS "Bundled ${_count} shared libraries into ${_libdir}")
