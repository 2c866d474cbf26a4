/* The C of ferry._ferry_cffi that cffi cannot express, compiled into the
 * module with the declarations cffi generates from the public headers
 * (python/build_backend/ferry_cdef.py). What lies between the FP_CDEF
 * markers is also given to cffi.FFI.cdef, so it is plain declarations. */
#ifndef FP_CFFI_BRIDGE_H
#define FP_CFFI_BRIDGE_H

/* FP_CDEF begin */
/* FP_CDEF end */

#endif
