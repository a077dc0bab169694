# Is a refactor of kernels/cuda behaviour-preserving without a GPU to test it on? Compare the PTX of every
# .cu file at two revisions, register numbers masked and lines sorted: equal means the same instructions,
# at most reordered by the compiler (as renaming a helper or moving a constant into a header does).
#   bash devtools/ptx_same.sh REV        (REV against the working tree)
set -e
rev=${1:?usage: ptx_same.sh REV}
tmp=$(mktemp -d); git archive "$rev" kernels/cuda | tar -x -C "$tmp"
norm() { sed -E 's/%(r|rd|rs|f|p)[0-9]+/%\1/g' "$1" | grep -v '^\s*\.reg' | sort | md5sum | cut -c1-12; }
for f in kernels/cuda/*.cu; do
  nvcc -std=c++17 -O3 -arch=sm_90 -ptx "$tmp/$f" -o "$tmp/old.ptx"; nvcc -std=c++17 -O3 -arch=sm_90 -ptx "$f" -o "$tmp/new.ptx"
  a=$(norm "$tmp/old.ptx"); b=$(norm "$tmp/new.ptx")
  echo "$f $a $b $([ "$a" = "$b" ] && echo same || echo DIFFERENT)"
done
rm -rf "$tmp"
