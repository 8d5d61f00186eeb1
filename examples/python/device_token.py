#!/usr/bin/env python3
"""The whole device flow, backend to device, with PyJWT (`pip install "pyjwt[crypto]"`).

1. Once, an operator issues the application a device key and hands the printed JWK to its backend:
       attune app key create --app photos --model digits > photos.jwk
2. The backend, which knows who its user is (its own login), signs a short-lived token for that user:
       python examples/python/device_token.py sign --key-file photos.jwk --user alice [--ttl 900]
   prints the token (a JWT, EdDSA, `kid` in its header, `sub` = the user, `aud` = "attune").
3. The device fetches its personal model with it, sending back the ETag it holds:
       python examples/python/device_token.py fetch --url http://attune:8080 --model digits --user alice \
           --token TOKEN [--etag '"digits@1/alice/v3"'] [--out digits.mlmodel]
   prints one JSON line: the status (200 with new bytes, 304 when nothing changed) and the ETag to keep.

A token opens only its user's models: another user's is 403, an expired or forged one 401. Keep tokens
short-lived (at most a day; attune serve refuses longer ones); rotate keys with `attune app key rotate
--grace 24h`, after which the backend signs with the new JWK at once and tokens of the old key stay valid
for the grace window.
"""
import argparse
import json
import sys
import time
import urllib.error
import urllib.request

import jwt


def sign(key_file, user, ttl, models=None):
    with open(key_file) as f:
        jwk = json.load(f)
    key = jwt.PyJWK(jwk).key  # an Ed25519 private key
    now = int(time.time())
    claims = {"sub": user, "aud": "attune", "iat": now, "exp": now + ttl}
    if models:
        claims["models"] = models
    return jwt.encode(claims, key, algorithm="EdDSA", headers={"kid": jwk["kid"]})


def fetch(url, model, user, token, etag=None, out=None):
    request = urllib.request.Request(f"{url}/v1/models/{model}/users/{user}",
                                      headers={"Authorization": f"Bearer {token}"})
    if etag:
        request.add_header("If-None-Match", etag)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            body = response.read()
            if out:
                with open(out, "wb") as f:
                    f.write(body)
            return {"status": response.status, "etag": response.headers.get("ETag"), "bytes": len(body)}
    except urllib.error.HTTPError as error:
        # 304 arrives as an "error" in urllib: nothing new, keep the model and the ETag you have.
        return {"status": error.code, "etag": error.headers.get("ETag") or etag, "bytes": 0}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("sign", help="the backend: sign a user's device token")
    s.add_argument("--key-file", required=True)
    s.add_argument("--user", required=True)
    s.add_argument("--ttl", type=int, default=900, help="seconds (at most 86400)")
    s.add_argument("--model", action="append", help="bind the token to these models only")
    f = sub.add_parser("fetch", help="the device: fetch its model if there is a newer one")
    f.add_argument("--url", required=True)
    f.add_argument("--model", required=True)
    f.add_argument("--user", required=True)
    f.add_argument("--token", required=True)
    f.add_argument("--etag")
    f.add_argument("--out")
    args = p.parse_args()
    if args.command == "sign":
        print(sign(args.key_file, args.user, args.ttl, args.model))
    else:
        print(json.dumps(fetch(args.url, args.model, args.user, args.token, args.etag, args.out)))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
