# Sourced by the loadtest scripts that open TLS doors: `test_certs DIR` makes a test CA and a
# certificate for 127.0.0.1 signed by it, with openssl: DIR/ca.pem (what clients trust),
# DIR/gateway.pem and DIR/gateway.key (what the gateway presents). ECDSA P-256, valid 2 days.
test_certs() {
  local dir=$1
  local ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
  mkdir -p "$dir"
  openssl req -x509 "${ec[@]}" -days 2 -subj "/CN=idlegate test CA" -keyout "$dir/ca.key" -out "$dir/ca.pem" 2>/dev/null
  openssl req "${ec[@]}" -subj /CN=gateway -keyout "$dir/gateway.key" -out "$dir/gateway.csr" 2>/dev/null
  printf 'subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n' >"$dir/gateway.ext"
  openssl x509 -req -in "$dir/gateway.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca.key" -CAcreateserial -days 2 \
    -extfile "$dir/gateway.ext" -out "$dir/gateway.pem" 2>/dev/null
}
