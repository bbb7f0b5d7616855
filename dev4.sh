export LD_LIBRARY_PATH=$PWD/.cjson/usr/lib/x86_64-linux-gnu
cmake --build build-dev -j 16 > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
G="NVIDIA H100 80GB HBM3"
{ printf '{"version": 1, "library": "0.1.0", "entries": [\n'
  printf ' {"gpu":"%s","format":"nvfp4","act":"bf16","k":4096,"n":28672,"m":"9-16","m_tuned":16,"path":"decode","kw":1,"splits":2,"variant":"staged","rpw":2,"us":1},\n' "$G"
  printf ' {"gpu":"%s","format":"nvfp4","act":"bf16","k":5120,"n":27648,"m":"9-16","m_tuned":16,"path":"decode","kw":1,"splits":2,"variant":"staged","rpw":2,"us":1}\n]}\n' "$G"; } > $OUT/s2.json
build-dev/nibble bench --shapes 4096x28672,5120x27648 --m 16,24,32 --formats nvfp4 2>&1 | tail -6
build-dev/nibble bench --shapes 4096x28672,5120x27648 --m 16 --formats nvfp4 --tune-cache $OUT/s2.json 2>&1 | tail -2
NIBBLE_LIBRARY=$PWD/build-dev/libnibble.so PYTHONPATH=$PWD/python python3 python/bench/layers.py --shapes 4096x28672,5120x27648 --m 16,24,32 --formats nvfp4 2>&1 | tail -8
NIBBLE_TUNE_CACHE=$OUT/s2.json NIBBLE_LIBRARY=$PWD/build-dev/libnibble.so PYTHONPATH=$PWD/python python3 python/bench/layers.py --shapes 4096x28672,5120x27648 --m 16 --formats nvfp4 2>&1 | tail -4
