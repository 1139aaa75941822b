# Sourced by the loadtest scripts: `usage` prints the calling script's header comment (its
# help) and exits 2, as a bad flag does elsewhere; -h or --help as the first argument calls it.
usage() {
  awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0" >&2
  exit 2
}
case "${1:-}" in -h | --help) usage ;; esac
