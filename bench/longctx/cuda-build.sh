# Sourced by gpu.sh (its build on the device) and prebuild.sh (the same build here, without a GPU): the one CUDA build of
# the tools the long-context protocol runs, so that a prebuilt bin.tar.gz is what the device would have built.
CUDA_BUILD_DEFINES=(-DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_BUILD_SERVER=ON
                    -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_APP=OFF)
CUDA_BUILD_TARGETS=(llama-server llama-perplexity llama-batched-bench)
# where the prebuilt tools (prebuild.sh; gpu.sh's use_prebuilt marks them with ~/llb/prebuilt) find cuBLAS, beside them
# in $1, and the driver's CUDA libraries: gpu.sh's and calibrate_gpu.sh's LD_LIBRARY_PATH
prebuilt_libs() { echo "$1:/usr/local/cuda/lib64:/usr/local/cuda/lib:/usr/local/cuda/targets/x86_64-linux/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; }
