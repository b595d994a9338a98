# Where scripts/install.sh installs pgoverlay: sourced by install.sh, test.sh and demo.sh.
# PREFIX/src is the copy of the checkout it was built from, PREFIX/venv the environment.
prefix=${PGOVERLAY_PREFIX:-/usr/local/lib/pgoverlay}
venv=$prefix/venv
