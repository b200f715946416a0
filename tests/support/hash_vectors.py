"""Password hashes made by third-party implementations, for the import test:
prints one JSON object per line, {"format", "password", "record"}, where
"record" is an account line of latchkey's import format
({"email", "password_hash"} or {"email", "keycloak"}).

Makers: the `bcrypt` package (2a, 2b, 2y), passlib (pbkdf2_sha256,
pbkdf2_sha512, scrypt: its PHC strings in its adapted base64), Django's own
PBKDF2 hasher, hashlib (PBKDF2-SHA256 and -SHA512 laid out as Keycloak
exports them and as standard PHC strings; scrypt as a standard PHC string)
and argon2-cffi (argon2i, argon2d, argon2id).

usage: hash_vectors.py EMAIL_TAG
"""
import base64
import hashlib
import json
import os
import sys

import bcrypt
from argon2 import PasswordHasher, Type
from passlib.hash import pbkdf2_sha256, pbkdf2_sha512
from passlib.hash import scrypt as passlib_scrypt

import django
from django.conf import settings

settings.configure(PASSWORD_HASHERS=["django.contrib.auth.hashers.PBKDF2PasswordHasher"])
django.setup()
from django.contrib.auth.hashers import make_password  # noqa: E402

tag = sys.argv[1]
out = []


def add(fmt, password, **record):
    out.append({
        "format": fmt,
        "password": password,
        "record": {"email": f"{tag}-{fmt}@example.test", "verified": True, **record},
    })


def b64(raw):
    return base64.b64encode(raw).decode()


bc = bcrypt.hashpw(b"bcrypt pass 2b", bcrypt.gensalt(rounds=5)).decode()
add("bcrypt-2b", "bcrypt pass 2b", password_hash=bc)
bc = bcrypt.hashpw(b"bcrypt pass 2a", bcrypt.gensalt(rounds=5, prefix=b"2a")).decode()
add("bcrypt-2a", "bcrypt pass 2a", password_hash=bc)
# PHP writes $2y$ for the same algorithm; the bcrypt package reads it but
# writes 2a/2b, so the 2b hash is relabelled as PHP would write it.
bc = bcrypt.hashpw(b"bcrypt pass 2y", bcrypt.gensalt(rounds=5)).decode().replace("$2b$", "$2y$", 1)
add("bcrypt-2y", "bcrypt pass 2y", password_hash=bc)

add("passlib-pbkdf2-sha256", "passlib sha256 pass",
    password_hash=pbkdf2_sha256.using(rounds=2000).hash("passlib sha256 pass"))
add("passlib-pbkdf2-sha512", "passlib sha512 pass",
    password_hash=pbkdf2_sha512.using(rounds=2000).hash("passlib sha512 pass"))
add("django-pbkdf2-sha256", "django pass word",
    password_hash=make_password("django pass word", hasher="pbkdf2_sha256"))

# Keycloak's realm export: credentialData and secretData as JSON strings.
salt = os.urandom(16)
kc = hashlib.pbkdf2_hmac("sha512", b"keycloak pass word", salt, 2100, dklen=64)
add("keycloak-pbkdf2-sha512", "keycloak pass word", keycloak={
    "credentialData": json.dumps({"hashIterations": 2100, "algorithm": "pbkdf2-sha512", "additionalParameters": {}}),
    "secretData": json.dumps({"value": b64(kc), "salt": b64(salt), "additionalParameters": {}}),
})

salt = os.urandom(16)
sc = hashlib.scrypt(b"scrypt pass word", salt=salt, n=1 << 10, r=8, p=1, dklen=32)
nopad = lambda raw: base64.b64encode(raw).decode().rstrip("=")  # noqa: E731
add("hashlib-scrypt", "scrypt pass word", password_hash=f"$scrypt$ln=10,r=8,p=1${nopad(salt)}${nopad(sc)}")
add("passlib-scrypt", "passlib scrypt pass",
    password_hash=passlib_scrypt.using(rounds=10).hash("passlib scrypt pass"))

add("argon2i", "argon two i pass",
    password_hash=PasswordHasher(time_cost=2, memory_cost=8192, parallelism=1, type=Type.I).hash("argon two i pass"))
add("argon2id", "argon two id pass",
    password_hash=PasswordHasher(time_cost=2, memory_cost=8192, parallelism=1, type=Type.ID).hash("argon two id pass"))
add("argon2d", "argon two d pass",
    password_hash=PasswordHasher(time_cost=2, memory_cost=8192, parallelism=1, type=Type.D).hash("argon two d pass"))

# PBKDF2 as a standard PHC string ($pbkdf2-sha256$i=...,l=...$salt$hash,
# unpadded base64), as RustCrypto and many Go systems write it; the hash
# is hashlib's.
for digest, size in (("sha256", 32), ("sha512", 64)):
    salt = os.urandom(16)
    dk = hashlib.pbkdf2_hmac(digest, f"phc {digest} pass".encode(), salt, 2000, dklen=size)
    add(f"phc-pbkdf2-{digest}", f"phc {digest} pass",
        password_hash=f"$pbkdf2-{digest}$i=2000,l={size}${nopad(salt)}${nopad(dk)}")

# Keycloak's realm export with its other algorithm, pbkdf2-sha256.
salt = os.urandom(16)
kc = hashlib.pbkdf2_hmac("sha256", b"keycloak sha256 pass", salt, 2100, dklen=32)
add("keycloak-pbkdf2-sha256", "keycloak sha256 pass", keycloak={
    "credentialData": json.dumps({"hashIterations": 2100, "algorithm": "pbkdf2-sha256", "additionalParameters": {}}),
    "secretData": json.dumps({"value": b64(kc), "salt": b64(salt), "additionalParameters": {}}),
})

for o in out:
    print(json.dumps(o))
