"""CUDA C++ kernels for what Triton cannot express: thread-block clusters and distributed shared
memory on Hopper (``cluster_distribute``). Source is generated here, compiled with nvcc through
``tvm.support.nvcc`` and launched by TVM's CUDA runtime module, which launches with the cluster
dimension when a kernel's launch tags include ``clusterCtaIdx.x``."""
