#!/bin/sh
# Makes what docker-compose.yml mounts as secrets, in ./secrets (or the folder given), readable only
# by you: the PostgreSQL password, NATS's user and password (its authorization block, and the
# URL with them that the services read), the services' shared token (role service), a user token (the
# tokens file the services read, and user_token for your clients: RLVR_TOKEN), and TLS material (a
# CA, and one certificate for the five services' compose host names plus localhost/127.0.0.1, good
# for server and client auth). Files already there are kept, so rerunning it rotates nothing;
# delete a file to make it again. Needs the openssl CLI.
# RLVR_TLS_NAMES adds host names and IP addresses to the certificate (comma or space list), for
# services on several hosts (docs/operations.md); it applies when the certificate is made.
#
#   deploy/make-secrets.sh && docker compose up
#   RLVR_TLS_NAMES=host-a,host-b deploy/make-secrets.sh /etc/rlvr
#   RLVR_TOKEN=$(cat secrets/user_token) RLVR_CA_FILE=secrets/tls/ca.pem rlvr jobs list
set -eu
out="${1:-secrets}"
umask 077
mkdir -p "$out/tls"
token() { openssl rand -hex 32; }

[ -s "$out/postgres_password" ] || openssl rand -hex 24 > "$out/postgres_password"
if [ ! -s "$out/nats_auth.conf" ] || [ ! -s "$out/nats_url" ]; then
  nats_password="$(openssl rand -hex 24)"
  printf 'authorization { user: "rlvr", password: "%s" }\n' "$nats_password" > "$out/nats_auth.conf"
  printf 'nats://rlvr:%s@nats:4222\n' "$nats_password" > "$out/nats_url"
fi
[ -s "$out/service_token" ] || token > "$out/service_token"
if [ ! -s "$out/tokens.json" ] || [ ! -s "$out/user_token" ]; then
  user="$(token)"
  printf '%s\n' "$user" > "$out/user_token"
  printf '{"%s": "user"}\n' "$user" > "$out/tokens.json"
fi
if [ ! -s "$out/tls/ca.pem" ] || [ ! -s "$out/tls/server.pem" ]; then
  tls="$out/tls"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 825 -subj "/CN=rlvr CA" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
    -keyout "$tls/ca.key" -out "$tls/ca.pem" 2>/dev/null
  openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=rlvr services" \
    -keyout "$tls/server.key" -out "$tls/server.csr" 2>/dev/null
  san="DNS:scheduler,DNS:trainer,DNS:reward,DNS:rollout,DNS:benchmark,DNS:nats,DNS:localhost,IP:127.0.0.1"
  for name in $(printf '%s' "${RLVR_TLS_NAMES:-}" | tr ',' ' '); do
    if printf '%s' "$name" | grep -Eq '^[0-9.]+$|:'; then san="$san,IP:$name"; else san="$san,DNS:$name"; fi
  done
  printf '%s\n' "subjectAltName=$san" "extendedKeyUsage=serverAuth,clientAuth" > "$tls/server.ext"
  openssl x509 -req -in "$tls/server.csr" -CA "$tls/ca.pem" -CAkey "$tls/ca.key" -CAcreateserial -days 825 \
    -extfile "$tls/server.ext" -out "$tls/server.pem" 2>/dev/null
  rm -f "$tls/server.csr" "$tls/server.ext" "$tls/ca.srl"
fi
echo "secrets in $out: postgres_password, nats_auth.conf + nats_url, service_token, tokens.json + user_token, tls/{ca,server}.pem"
