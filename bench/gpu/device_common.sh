# Steps shared by the device check scripts (sourced, not run). The device image may lack googletest: its
# sources travel in .gtest-src (carried) and are installed to /tmp/gtest here.

# Prints the CMake flag that finds googletest, installing it from .gtest-src first when the system has none.
gtest_prefix_flag() {
  if [ ! -f /usr/include/gtest/gtest.h ] && [ -d .gtest-src ]; then
    { cmake -S .gtest-src -B /tmp/gtest-build -G Ninja -DCMAKE_INSTALL_PREFIX=/tmp/gtest -DBUILD_GMOCK=OFF &&
      ninja -C /tmp/gtest-build install; } > /tmp/gtest.log 2>&1 || tail -20 /tmp/gtest.log >&2
    echo "-DCMAKE_PREFIX_PATH=/tmp/gtest"
  fi
}

# build_tree SRC BUILD [cmake flags...] -- [ninja targets...]: configures SRC for sm_90 (the sm_90a objects
# build regardless) and builds the targets with every core.
build_tree() {
  local src=$1 build=$2
  shift 2
  local flags=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do flags+=("$1"); shift; done
  [ "${1:-}" = "--" ] && shift
  cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 "${flags[@]}" && ninja -C "$build" -j"$(nproc)" "$@"
}

# link_bench_program SRC LIB OUT [nvcc flags...]: a timing program of bench/gpu (SRC) linked against the static
# library LIB (a build of this tree), for sm_90.
link_bench_program() {
  local src=$1 lib=$2 out=$3
  shift 3
  nvcc -O2 -std=c++17 -arch=sm_90 "$@" -Iinclude -Isrc "$src" "$lib" -Xcompiler -fopenmp -o "$out"
}

# copy_tree DST: the working tree without build outputs, for a variant build beside the main one.
copy_tree() {
  rm -rf "$1" && mkdir -p "$1"
  tar --exclude='./build*' --exclude='./.git' --exclude='./.gtest-src' -cf - . | (cd "$1" && tar -xf -)
}

# start_device_run DEFAULT_OUT: makes $OUT (DEFAULT_OUT unless set), starts $log (its build log) with the GPU's name
# and clocks, and sets $R (the repository root), $prefix (the googletest flag) and $t0 (the start, in seconds).
start_device_run() {
  t0=$(date +%s)
  OUT=${OUT:-$1}
  mkdir -p "$OUT"
  log=$OUT/build.log
  R=$(pwd)
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > "$log" 2>&1
  prefix=$(gtest_prefix_flag)
}

# run_rest_of_suite BINARY FILTER: the GPU suite without FILTER's tests ($OUT/full.log), then every CUDA pytest
# case ($OUT/pytest-cuda.log), with PYTHONPATH as the caller set it.
run_rest_of_suite() {
  timeout 300 "$1" --gtest_filter="-$2" > "$OUT/full.log" 2>&1
  echo "full rc=$?" >> "$OUT/full.log"
  (cd /tmp && timeout 150 python3 -m pytest -q -p no:cacheprovider "$R/tests/python" -m cuda > "$OUT/pytest-cuda.log" 2>&1
   echo "pytest-cuda rc=$?" >> "$OUT/pytest-cuda.log")
}

# fp8_pytest LOG: the FP8 pytest cases (tests/python/test_fp8_cuda.py and the FP8 cases of the FA3 and SDPA suites;
# -s: the backward cases print their errors) with PYTHONPATH as the caller set it, into LOG with their exit code.
fp8_pytest() {
  (cd /tmp && timeout 180 python3 -m pytest -q -s -p no:cacheprovider "$R/tests/python/test_fp8_cuda.py" \
     "$R/tests/python/test_fa3.py" "$R/tests/python/test_sdpa.py" -k "fp8 or float8" > "$1" 2>&1
   echo "pytest rc=$?" >> "$1")
}

# pytest_memcheck LOG FILE K: pytest's cases of tests/python/FILE selected by -k K under compute-sanitizer's memcheck,
# with PYTHONPATH as the caller set it, into LOG with their exit code.
pytest_memcheck() {
  (cd /tmp && timeout 120 compute-sanitizer --tool memcheck python3 -m pytest -q -p no:cacheprovider \
     "$R/tests/python/$2" -k "$3" > "$1" 2>&1
   echo "memcheck rc=$?" >> "$1")
}

# build_python_tree BUILD [cmake flags...] [-- targets...]: build_tree of this tree with the Python module (no CLI,
# no benchmark programs) into BUILD, its exit code and time appended to $log.
build_python_tree() {
  local build=$1 start
  shift
  start=$(date +%s)
  build_tree . "$build" -DFLASHATTN_BUILD_CLI=OFF -DFLASHATTN_BUILD_PYTHON=ON -DFLASHATTN_BUILD_BENCH=OFF $prefix "$@" \
    >> "$log" 2>&1
  echo "build rc=$? in $(( $(date +%s) - start )) s" >> "$log"
}

# unpack_prebuilt: the programs that bench/tools/prebuild_for_device.sh packed into .devbin (carried) into
# /tmp/prebuilt, and PYTHONPATH to its Python package where one was packed. Prints the commit they were built from.
unpack_prebuilt() {
  mkdir -p /tmp/prebuilt
  local program
  for program in flashattn_gpu_tests backward_bench; do
    [ -f ".devbin/$program.xz" ] || continue
    xz -T0 -dc ".devbin/$program.xz" > "/tmp/prebuilt/$program" && chmod +x "/tmp/prebuilt/$program"
  done
  if [ -f .devbin/python.tar.xz ]; then
    tar -C /tmp/prebuilt -xJf .devbin/python.tar.xz && export PYTHONPATH=/tmp/prebuilt/python
  fi
  echo "prebuilt from $(cat .devbin/COMMIT 2>/dev/null || echo '?')"
}

# unpack_prebuilt_base: the baseline's Python package, packed by the same script from another tree and carried in
# .devbase/python.tar.xz, into /tmp/prebuilt-base (its module under /tmp/prebuilt-base/python). Prints the commit it
# was built from; fails where none was carried.
unpack_prebuilt_base() {
  [ -f .devbase/python.tar.xz ] || return 1
  mkdir -p /tmp/prebuilt-base && tar -C /tmp/prebuilt-base -xJf .devbase/python.tar.xz || return 1
  echo "baseline module from $(cat .devbase/COMMIT 2>/dev/null || echo '?')"
}

# unpack_prebuilt_variant NAME: a variant's Python package into /tmp/build-NAME/python, from
# .devbin/python-NAME.tar.xz, or as the tree's package (unpack_prebuilt first) with its extension rebuilt from the
# zstd patch .devbin/_C-NAME.patch (zstd --patch-from the tree's extension module; a zstd binary and its liblz4
# may travel in .devbin). Fails where neither was carried.
unpack_prebuilt_variant() {
  local dir=/tmp/build-$1
  mkdir -p "$dir"
  if [ -f ".devbin/python-$1.tar.xz" ]; then
    tar -C "$dir" -xJf ".devbin/python-$1.tar.xz"
    return
  fi
  [ -f ".devbin/_C-$1.patch" ] || return 1
  local zstd_cmd=zstd
  command -v zstd > /dev/null || zstd_cmd="env LD_LIBRARY_PATH=$PWD/.devbin $PWD/.devbin/zstd"
  # The extension's file name: _C.abi3.so from a stable-ABI build, _C.cpython-3XX-<platform>.so otherwise.
  local module
  module=$(basename "$(ls /tmp/prebuilt/python/flashattn/_C*.so | head -1)")
  rm -rf "$dir/python" && cp -r /tmp/prebuilt/python "$dir/python" &&
    $zstd_cmd -q -d -f --long=27 --patch-from="/tmp/prebuilt/python/flashattn/$module" ".devbin/_C-$1.patch" \
      -o "$dir/python/flashattn/$module"
}
