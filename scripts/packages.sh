# Sourced by the setup scripts: missing_packages PKG... sets the array `missing` to those
# of the named Debian packages (NAME or NAME:ARCH) that are not installed.
missing_packages() {
  missing=()
  local p
  for p in "$@"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
      missing+=("$p")
    fi
  done
}
