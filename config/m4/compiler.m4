# SHOAL_CC_VEC_FLAGS: the vectoriser flags of the reduction kernels that this compiler takes
# (gcc's -fvect-cost-model and -ftree-loop-vectorize are unknown to clang, which vectorises
# at -O3 anyway). Sets SHOAL_VEC_CFLAGS.
AC_DEFUN([SHOAL_CC_VEC_FLAGS], [
    SHOAL_VEC_CFLAGS=""
    for shoal_flag in -fvect-cost-model=dynamic -ftree-loop-vectorize; do
        AC_MSG_CHECKING([whether $CC accepts $shoal_flag])
        shoal_save_CFLAGS="$CFLAGS"
        CFLAGS="$CFLAGS -Werror $shoal_flag"
        AC_COMPILE_IFELSE([AC_LANG_PROGRAM([], [])],
            [AC_MSG_RESULT([yes]); SHOAL_VEC_CFLAGS="$SHOAL_VEC_CFLAGS $shoal_flag"],
            [AC_MSG_RESULT([no])])
        CFLAGS="$shoal_save_CFLAGS"
    done
    AC_SUBST([SHOAL_VEC_CFLAGS])
])
