# Cross build for 64-bit ARM Linux with Debian's cross toolchain (crossbuild-essential-arm64)
# and the arm64 builds of the dependencies installed through multiarch
# (scripts/setup_arm64.sh). Tests run under qemu-user: ctest and gtest_discover_tests start
# every test binary through CMAKE_CROSSCOMPILING_EMULATOR.
#   cmake -S . -B build-arm64 -G Ninja --toolchain cmake/aarch64-linux-gnu.cmake
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(SLIM_CROSS_TRIPLE aarch64-linux-gnu)

set(CMAKE_C_COMPILER ${SLIM_CROSS_TRIPLE}-gcc)
set(CMAKE_CXX_COMPILER ${SLIM_CROSS_TRIPLE}-g++)

# Multiarch: the target's libraries live in /usr/lib/aarch64-linux-gnu and its CMake
# configs in /usr/lib/aarch64-linux-gnu/cmake; the headers in /usr/include are shared
# (architecture-specific ones sit in /usr/include/aarch64-linux-gnu). CMake's
# CMAKE_LIBRARY_ARCHITECTURE picks those folders once it is set.
set(CMAKE_LIBRARY_ARCHITECTURE ${SLIM_CROSS_TRIPLE})
set(CMAKE_FIND_ROOT_PATH /usr/${SLIM_CROSS_TRIPLE})
# Programs (protoc, python3) are the build machine's; libraries and headers are searched
# in the target folders first, then in the shared /usr (the multiarch layout).
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE BOTH)

# pkg-config must read the arm64 .pc files, never the host's.
set(ENV{PKG_CONFIG_LIBDIR} /usr/lib/${SLIM_CROSS_TRIPLE}/pkgconfig:/usr/share/pkgconfig)
set(ENV{PKG_CONFIG_PATH} "")

# oneDNN's arm64 development files, unpacked by scripts/setup_arm64.sh (libdnnl-dev:arm64
# cannot be installed beside the amd64 one).
if(NOT SLIM_ARM64_DEPS)
  get_filename_component(SLIM_ARM64_DEPS "${CMAKE_CURRENT_LIST_DIR}/../build-arm64-deps" ABSOLUTE)
endif()
if(NOT dnnl_DIR AND EXISTS "${SLIM_ARM64_DEPS}/usr/lib/${SLIM_CROSS_TRIPLE}/cmake/dnnl/dnnl-config.cmake")
  set(dnnl_DIR "${SLIM_ARM64_DEPS}/usr/lib/${SLIM_CROSS_TRIPLE}/cmake/dnnl" CACHE PATH "oneDNN's arm64 CMake config")
endif()

# qemu's library prefix is / and not /usr/aarch64-linux-gnu: the arm64 -dev packages pull in
# libc6:arm64, so the dynamic loader and every library sit in the multiarch folders, and
# with -L /usr/aarch64-linux-gnu the cross toolchain's loader (libc6-arm64-cross, another
# glibc build) would run with libc6:arm64's libc: threads then hang at creation.
find_program(SLIM_QEMU_AARCH64 qemu-aarch64 qemu-aarch64-static)
if(SLIM_QEMU_AARCH64)
  set(CMAKE_CROSSCOMPILING_EMULATOR ${SLIM_QEMU_AARCH64} -L /)
endif()
