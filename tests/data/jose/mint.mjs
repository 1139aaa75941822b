// docs/CLIENTS.md's Node example of minting a login token with `jose`, as a backend would,
// run by tests/jwt.rs. Usage: node mint.mjs <private key, PKCS#8 PEM>
// Prints {"token": "<the JWT>", "jwks": {"keys": [<the public key, kid rsa-1>]}}.
import { readFileSync } from 'node:fs';
import { createPublicKey } from 'node:crypto';
import { SignJWT, importPKCS8, exportJWK } from 'jose';

const privatePem = readFileSync(process.argv[2], 'utf8');

// The example, as docs/CLIENTS.md shows it.
const key = await importPKCS8(privatePem, 'RS256');
const token = await new SignJWT({ name: 'Ada', org: 'acme' })
  .setProtectedHeader({ alg: 'RS256', kid: 'rsa-1' }).setSubject('42').setExpirationTime('1h').sign(key);

// The gateway's --jwt-key-file: the public half as a JWKS.
const jwk = await exportJWK(createPublicKey(privatePem));
console.log(JSON.stringify({ token, jwks: { keys: [{ ...jwk, kid: 'rsa-1', alg: 'RS256', use: 'sig' }] } }));
