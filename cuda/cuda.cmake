# The CUDA provider, libortmod_cuda.so (included by CMakeLists.txt). Built where nvcc and the cuBLAS
# headers are found; otherwise the configure says why it skipped and the CPU build goes on
# (ORTMOD_CUDA=ON makes that an error). The engine never links it: it dlopens it on the first CUDA
# tensor (csrc/exec/device.c).
#
#   nvcc    CUDACXX, else nvcc on PATH, else /usr/local/cuda/bin/nvcc
#   cuBLAS  CUBLAS_ROOT (include/ and lib/), else the toolkit's own, else the nvidia-cublas wheel
#           next to the build's Python (nvidia/cu<N> or nvidia/cublas: what torch's CUDA wheels
#           install, and what make setup installs into .venv where nvcc is present)
if(ORTMOD_CUDA STREQUAL "OFF")
    return()
endif()

function(ortmod_cuda_skip why)
    if(ORTMOD_CUDA STREQUAL "ON")
        message(FATAL_ERROR "CUDA provider: ${why}")
    endif()
    message(STATUS "CUDA provider skipped: ${why}")
endfunction()

if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND EXISTS /usr/local/cuda/bin/nvcc)
    find_program(ORTMOD_NVCC nvcc)
    if(NOT ORTMOD_NVCC)
        set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
    endif()
endif()
include(CheckLanguage)
check_language(CUDA)
if(NOT CMAKE_CUDA_COMPILER)
    ortmod_cuda_skip("nvcc not found (the CUDA provider is built where the CUDA toolkit is installed)")
    return()
endif()

# the architectures: SASS for each of ORTMOD_CUDA_ARCHS, and compute_80 PTX that newer GPUs JIT
set(archs "")
foreach(a ${ORTMOD_CUDA_ARCHS})
    list(APPEND archs "${a}-real")
endforeach()
list(APPEND archs "80-virtual")
set(CMAKE_CUDA_ARCHITECTURES "${archs}")
enable_language(CUDA)
find_package(CUDAToolkit QUIET)
string(REGEX MATCH "^[0-9]+" CUDA_MAJOR "${CMAKE_CUDA_COMPILER_VERSION}")

set(cublas_hints "")
if(DEFINED ENV{CUBLAS_ROOT})
    list(APPEND cublas_hints "$ENV{CUBLAS_ROOT}")
endif()
if(CUBLAS_ROOT)
    list(APPEND cublas_hints "${CUBLAS_ROOT}")
endif()
foreach(d ${CUDAToolkit_INCLUDE_DIRS})
    list(APPEND cublas_hints "${d}/..")
endforeach()
execute_process(COMMAND "${Python_EXECUTABLE}" -c
    "import site, sysconfig\nfor d in dict.fromkeys([sysconfig.get_paths()['platlib']] + site.getsitepackages()): print(d)"
    OUTPUT_VARIABLE site_dirs OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
string(REPLACE "\n" ";" site_dirs "${site_dirs}")
foreach(s ${site_dirs})
    list(APPEND cublas_hints "${s}/nvidia/cu${CUDA_MAJOR}" "${s}/nvidia/cublas")
endforeach()
find_path(CUBLAS_INCLUDE_DIR cublas_v2.h HINTS ${cublas_hints} PATH_SUFFIXES include NO_DEFAULT_PATH)
if(NOT CUBLAS_INCLUDE_DIR)
    ortmod_cuda_skip("cuBLAS headers not found (give CUBLAS_ROOT, or pip install nvidia-cublas next to the build's Python)")
    return()
endif()
get_filename_component(cublas_root "${CUBLAS_INCLUDE_DIR}/.." ABSOLUTE)
# the wheels ship only libcublas.so.<major>: link that name where the unversioned one is missing
find_library(CUBLAS_LIB NAMES cublas libcublas.so.${CUDA_MAJOR} HINTS "${cublas_root}" PATH_SUFFIXES lib lib64 NO_DEFAULT_PATH)
find_library(CUBLASLT_LIB NAMES cublasLt libcublasLt.so.${CUDA_MAJOR} HINTS "${cublas_root}" PATH_SUFFIXES lib lib64 NO_DEFAULT_PATH)
if(NOT CUBLAS_LIB OR NOT CUBLASLT_LIB)
    ortmod_cuda_skip("cuBLAS libraries not found next to ${CUBLAS_INCLUDE_DIR}")
    return()
endif()
get_filename_component(cublas_libdir "${CUBLAS_LIB}" DIRECTORY)
message(STATUS "CUDA provider: nvcc ${CMAKE_CUDA_COMPILER_VERSION}, cuBLAS from ${cublas_root}, architectures ${archs}")

file(GLOB CUDA_SOURCES CONFIGURE_DEPENDS cuda/*.cu)
add_library(ortmod_cuda SHARED ${CUDA_SOURCES})
target_include_directories(ortmod_cuda PRIVATE cuda csrc csrc/include "${CUBLAS_INCLUDE_DIR}")
set(cuda_rpath "$ORIGIN/../nvidia/cu${CUDA_MAJOR}/lib;$ORIGIN/../nvidia/cublas/lib")
if(NOT SKBUILD)
    list(APPEND cuda_rpath "${cublas_libdir}")
endif()
set_target_properties(ortmod_cuda PROPERTIES
    CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON CUDA_VISIBILITY_PRESET hidden
    CUDA_RUNTIME_LIBRARY Static
    # cuBLAS is found at run time next to the package (site-packages/nvidia/..., where torch's CUDA
    # wheels put it; a process that loaded torch's cuBLAS already reuses it by soname), then, but
    # not in a wheel, where it was found at build time
    BUILD_RPATH "${cublas_libdir}"
    INSTALL_RPATH "${cuda_rpath}")
target_compile_options(ortmod_cuda PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr -Xcudafe --diag_suppress=177>)
target_link_libraries(ortmod_cuda PRIVATE "${CUBLAS_LIB}" "${CUBLASLT_LIB}" Threads::Threads)
target_link_options(ortmod_cuda PRIVATE "LINKER:--no-undefined")
install(TARGETS ortmod_cuda LIBRARY DESTINATION ortmod)
