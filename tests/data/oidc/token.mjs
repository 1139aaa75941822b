// A JWT access token from the provider of provider.mjs, by the client credentials grant,
// as a backend asks for one (the CA comes from NODE_EXTRA_CA_CERTS).
//
//   node token.mjs <issuer>
//
// Prints the access token.
const [issuer] = process.argv.slice(2);
const discovery = await (await fetch(`${issuer}/.well-known/openid-configuration`)).json();
const answer = await fetch(discovery.token_endpoint, {
  method: 'POST',
  headers: {
    'content-type': 'application/x-www-form-urlencoded',
    authorization: 'Basic ' + Buffer.from('backend:backend-secret').toString('base64'),
  },
  body: new URLSearchParams({ grant_type: 'client_credentials', scope: 'presence', resource: 'urn:idlegate' }),
});
const body = await answer.json();
if (!answer.ok) {
  console.error(JSON.stringify(body));
  process.exit(1);
}
console.log(body.access_token);
