// An OpenID provider nobody on this project wrote (npm's oidc-provider, OpenID Certified)
// for tests/oidc.rs, over HTTPS on loopback with the test's certificate.
//
//   node provider.mjs <port> <cert.pem> <key.pem> <state dir> <key names>
//
// Issuer https://localhost:<port>. Its signing keys are RSA keys kept in the state dir,
// one private JWK a name (made on first use, kid = the name); <key names> (comma-separated)
// are those it publishes, the first signing: restarting it with "k2,k1", then "k2", is a
// key rotation as a provider does it. One client, `backend` (secret `backend-secret`),
// takes tokens by the client credentials grant for the resource `urn:idlegate`: JWT access
// tokens (RFC 9068) with aud `idlegate` and a numeric `uid` claim, the client's own (42).
// Prints "LISTENING <port>" once it serves.
import { readFileSync, writeFileSync, existsSync } from 'node:fs';
import https from 'node:https';
import { generateKeyPair, exportJWK } from 'jose';
import Provider from 'oidc-provider';

const [port, certFile, keyFile, stateDir, names] = process.argv.slice(2);

async function privateKey(name) {
  const file = `${stateDir}/${name}.jwk.json`;
  if (!existsSync(file)) {
    const { privateKey } = await generateKeyPair('RS256', { modulusLength: 2048, extractable: true });
    const jwk = { ...(await exportJWK(privateKey)), kid: name, alg: 'RS256', use: 'sig' };
    writeFileSync(file, JSON.stringify(jwk));
  }
  return JSON.parse(readFileSync(file, 'utf8'));
}

const keys = [];
for (const name of names.split(',')) keys.push(await privateKey(name));

const issuer = `https://localhost:${port}`;
const provider = new Provider(issuer, {
  clients: [{
    client_id: 'backend',
    client_secret: 'backend-secret',
    grant_types: ['client_credentials'],
    redirect_uris: [],
    response_types: [],
    scope: 'presence',
    uid: 42,
  }],
  scopes: ['openid', 'presence'],
  extraClientMetadata: { properties: ['uid'] },
  jwks: { keys },
  features: {
    devInteractions: { enabled: false },
    clientCredentials: { enabled: true },
    resourceIndicators: {
      enabled: true,
      defaultResource: () => 'urn:idlegate',
      useGrantedResource: () => true,
      getResourceServerInfo: () => ({
        scope: 'presence',
        audience: 'idlegate',
        accessTokenTTL: 600,
        accessTokenFormat: 'jwt',
        jwt: { sign: { alg: 'RS256' } },
      }),
    },
  },
  extraTokenClaims: (ctx, token) => ({ uid: token.client?.uid ?? ctx.oidc.client?.uid }),
});
provider.proxy = false;

const server = https.createServer({ cert: readFileSync(certFile), key: readFileSync(keyFile) }, provider.callback());
server.listen(Number(port), '127.0.0.1', () => console.log(`LISTENING ${server.address().port}`));
process.on('SIGTERM', () => server.close(() => process.exit(0)));
