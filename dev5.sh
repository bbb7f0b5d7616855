set -u
cmake -S . -B build-dev -G Ninja -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_BUILD_TYPE=Release -DNB_CJSON_INCLUDE_DIR=$PWD/.cjson/usr/include -DNB_CJSON_LIBRARY=$PWD/.cjson/usr/lib/x86_64-linux-gnu/libcjson.so > $OUT/cmake.log 2>&1 && cmake --build build-dev -j 16 > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
export LD_LIBRARY_PATH=$PWD/.cjson/usr/lib/x86_64-linux-gnu
timeout 100 build-dev/tests/test_gpu --quick > $OUT/tg.log 2>&1; echo "test_gpu rc=$?"; grep -m3 FAIL $OUT/tg.log; tail -1 $OUT/tg.log
timeout 150 build-dev/nibble tune --all --formats nvfp4 --shapes 8192x57344,8192x10240,5120x27648,8192x8192,4096x6144 --m 16,32 --out $OUT/t.json > $OUT/tune.txt 2>&1; echo "tune rc=$?"
grep -E "^[0-9]+/|tc bn=(16|32)|staged rpw=2 splits=1 |tc bn=64 splits=1 " $OUT/tune.txt | cut -c1-110
