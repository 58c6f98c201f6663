# SHOAL_CHECK_CUDA: --with-cuda[=yes|no|auto|DIR] (default auto: /usr/local/cuda if present),
# --with-cuda-arch=LIST (default 90: sm_90 code + compute_90 PTX for later chips).
# Defines NVCC, CUDA_CPPFLAGS/LDFLAGS/LIBS, NVCC_GENCODE, HAVE_CUDA, SHOAL_HAVE_CUDA.
AC_DEFUN([SHOAL_CHECK_CUDA], [
    AC_ARG_WITH([cuda],
        [AS_HELP_STRING([--with-cuda@<:@=yes|no|auto|DIR@:>@], [CUDA toolkit (default: auto, /usr/local/cuda)])],
        [], [with_cuda=auto])
    AC_ARG_WITH([cuda-arch],
        [AS_HELP_STRING([--with-cuda-arch=LIST], [comma-separated SM versions for device code (default: 90)])],
        [], [with_cuda_arch=90])
    shoal_have_cuda=0
    CUDA_CPPFLAGS=""
    CUDA_LDFLAGS=""
    CUDA_LIBS=""
    NVCC=""
    NVCC_GENCODE=""
    AS_IF([test "x$with_cuda" != "xno"], [
        shoal_cuda_dir=""
        AS_CASE(["x$with_cuda"],
            [xyes|xauto], [AS_IF([test -d /usr/local/cuda], [shoal_cuda_dir=/usr/local/cuda])],
            [shoal_cuda_dir="$with_cuda"])
        AS_IF([test -n "$shoal_cuda_dir" && test -x "$shoal_cuda_dir/bin/nvcc"],
              [NVCC="$shoal_cuda_dir/bin/nvcc"],
              [AC_PATH_PROG([NVCC], [nvcc], [])])
        AS_IF([test -n "$shoal_cuda_dir"], [
            CUDA_CPPFLAGS="-I$shoal_cuda_dir/include"
            AS_IF([test -d "$shoal_cuda_dir/lib64"], [CUDA_LDFLAGS="-L$shoal_cuda_dir/lib64"],
                  [CUDA_LDFLAGS="-L$shoal_cuda_dir/lib"])
        ])
        shoal_save_CPPFLAGS="$CPPFLAGS"
        CPPFLAGS="$CPPFLAGS $CUDA_CPPFLAGS"
        AC_CHECK_HEADER([cuda_runtime_api.h], [shoal_cuda_hdr=1], [shoal_cuda_hdr=0])
        AS_UNSET([ac_cv_header_cuda_h])
        AC_CHECK_HEADER([cuda.h], [], [shoal_cuda_hdr=0])
        CPPFLAGS="$shoal_save_CPPFLAGS"
        AS_IF([test -n "$NVCC" && test "$shoal_cuda_hdr" = "1"], [shoal_have_cuda=1])
        AS_IF([test "x$with_cuda" != "xauto" && test "$shoal_have_cuda" = "0"],
              [AC_MSG_ERROR([--with-cuda was given but nvcc or the CUDA headers were not found])])
        for a in `echo "$with_cuda_arch" | tr ',' ' '`; do
            NVCC_GENCODE="$NVCC_GENCODE -gencode=arch=compute_$a,code=sm_$a"
        done
        shoal_cuda_last=`echo "$with_cuda_arch" | tr ',' '\n' | tail -1`
        NVCC_GENCODE="$NVCC_GENCODE -gencode=arch=compute_$shoal_cuda_last,code=compute_$shoal_cuda_last"
    ])
    AS_IF([test "$shoal_have_cuda" = "0"], [CUDA_CPPFLAGS=""; CUDA_LDFLAGS=""; NVCC=""])
    AC_SUBST([NVCC])
    AC_SUBST([NVCC_GENCODE])
    AC_SUBST([CUDA_CPPFLAGS])
    AC_SUBST([CUDA_LDFLAGS])
    AC_SUBST([CUDA_LIBS])
    AM_CONDITIONAL([HAVE_CUDA], [test "$shoal_have_cuda" = "1"])
    AC_DEFINE_UNQUOTED([SHOAL_HAVE_CUDA], [$shoal_have_cuda], [Define to 1 if CUDA is usable])
])
