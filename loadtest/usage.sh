# Sourced by the loadtest scripts: `usage` prints the calling script's header comment (its
# help) and exits 2, as a bad flag does elsewhere.
usage() {
  awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0" >&2
  exit 2
}
