# SHOAL_DL_LIBDIR(NAME): defines SHOAL_<NAME>_LIBDIR to the first -L directory of
# <NAME>_LDFLAGS ("" if none): where libshoal looks for a library it loads at first use (UCX,
# verbs) when the dynamic loader's search path does not find it. Such a library is never
# linked: its flags are used for the headers only.
AC_DEFUN([SHOAL_DL_LIBDIR], [
    shoal_dl_libdir=""
    for shoal_dl_flag in $$1_LDFLAGS; do
        AS_CASE([$shoal_dl_flag],
                [-L*], [shoal_dl_libdir=`echo "$shoal_dl_flag" | sed 's/^-L//'`; break])
    done
    AC_DEFINE_UNQUOTED([SHOAL_$1_LIBDIR], ["$shoal_dl_libdir"],
                       [Directory where configure found $1, for loading it at first use])
])
