# The float outputs of the products (_outputs.pyx), as _kernels cimports them.
cimport numpy as cnp


cdef cnp.ndarray _empty_output(int nd, cnp.npy_intp *dims)
