#!/usr/bin/env bash
# A throwaway certificate authority for the test servers' TLS listeners, made with openssl:
#   scripts/tls.sh DIR
# writes, if missing: ca.pem/ca.key (the CA), server.pem/server.key (for the host name localhost only, so
# that 127.0.0.1 is a wrong host name), client.pem/client.key (CN attune, the database role it logs in as)
# and other-ca.pem (a CA that signed none of them: the "wrong CA" of the tests). Keys are 0600.
set -euo pipefail
dir=${1:?usage: tls.sh DIR}
mkdir -p "$dir"
cd "$dir"
[ -s other-ca.pem ] && exit 0
command -v openssl >/dev/null || { echo "tls.sh: openssl missing (apt-get install openssl)" >&2; exit 1; }
umask 077
quiet() { "$@" >/dev/null 2>&1 || { echo "tls.sh: failed: $*" >&2; exit 1; }; }
ca() {  # name subject
  quiet openssl req -x509 -newkey rsa:2048 -nodes -keyout "$1.key" -out "$1.pem" -days 30 -subj "$2" \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign
}
leaf() {  # name subject extensions
  quiet openssl req -newkey rsa:2048 -nodes -keyout "$1.key" -out "$1.csr" -subj "$2"
  printf '%s\n' "$3" >"$1.ext"
  quiet openssl x509 -req -in "$1.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -out "$1.pem" -days 30 \
    -extfile "$1.ext"
  rm -f "$1.csr" "$1.ext"
}
ca ca "/CN=Attune throwaway test CA"
leaf server "/CN=localhost" "subjectAltName=DNS:localhost
extendedKeyUsage=serverAuth"
leaf client "/CN=attune" "extendedKeyUsage=clientAuth"
ca other-ca "/CN=Some other CA"
rm -f other-ca.key ca.srl
chmod 644 ./*.pem
