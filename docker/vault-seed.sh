#!/bin/sh
# Seed a dev-mode Vault for sealgate: KV v2 at kv/, an example secret, a read-only
# policy for it, and an AppRole bound to that policy. Safe to run more than once.
# Needs VAULT_ADDR and VAULT_TOKEN (the dev root token); writes role-id and secret-id
# and a proxy token to $SEED_OUT (default ./vault-out) with mode 600.
set -eu

: "${VAULT_ADDR:?set VAULT_ADDR}"
: "${VAULT_TOKEN:?set VAULT_TOKEN}"
out="${SEED_OUT:-./vault-out}"

tries=0
until vault status >/dev/null 2>&1; do
    tries=$((tries + 1))
    if [ "$tries" -ge 30 ]; then
        echo "vault-seed: Vault at $VAULT_ADDR is not ready after 30s" >&2
        exit 1
    fi
    sleep 1
done

# Dev mode mounts KV v2 at secret/; sealgate's examples use kv/.
if ! vault secrets list -format=json | grep -q '"kv/"'; then
    vault secrets enable -path=kv -version=2 kv
fi

vault kv put -mount=kv ci/github \
    token="${EXAMPLE_GITHUB_TOKEN:-ghp_example_not_a_real_token}" \
    user="sealgate-ci"

# KV v2 data lives under kv/data/; read-only, nothing else.
vault policy write sealgate-reader - <<'POLICY'
path "kv/data/ci/*" {
  capabilities = ["read"]
}
POLICY

if ! vault auth list -format=json | grep -q '"approle/"'; then
    vault auth enable approle
fi

vault write auth/approle/role/sealgate \
    token_policies=sealgate-reader \
    token_ttl=1h \
    token_max_ttl=24h \
    secret_id_ttl=0

umask 077
mkdir -p "$out"
vault read -field=role_id auth/approle/role/sealgate/role-id >"$out/role-id"
vault write -f -field=secret_id auth/approle/role/sealgate/secret-id >"$out/secret-id"
# A token of the same policy for a proxy that logs in by token (docker/compose.yaml's), renewed by
# the proxy's use within its period.
vault token create -policy=sealgate-reader -period=24h -field=token >"$out/proxy-token"

echo "vault-seed: kv/ci/github written, policy sealgate-reader, approle sealgate"
echo "vault-seed: role-id, secret-id and proxy-token are in $out"
