// The JWTs the x402 flows sign with the service's active key (wallet decisions, payment tokens, escalation
// overrides) and check again when a client hands one back.
import { createLocalJWKSet, jwtVerify, SignJWT, type JWTPayload } from 'jose';
import { newId } from '../../domain/crypto.ts';
import type { Runtime } from '../../runtime.ts';

export class X402Tokens {
  private readonly jwks;

  constructor(private readonly runtime: Runtime) {
    this.jwks = createLocalJWKSet(runtime.keys.jwks as never);
  }

  /** Signs `claims` for `audience` (the party that will check them), expiring with what they authorize. */
  async sign(
    claims: Record<string, unknown>,
    audience: string,
    subject: string,
    expiresAt: Date,
    jti = newId('jti'),
  ): Promise<string> {
    const { keyId, privateKey } = this.runtime.keys.active;
    return new SignJWT(claims)
      .setProtectedHeader({ alg: 'EdDSA', kid: keyId, typ: 'JWT' })
      .setIssuer(this.runtime.config.publicBaseUrl)
      .setSubject(subject)
      .setAudience(audience)
      .setIssuedAt()
      .setExpirationTime(Math.floor(expiresAt.getTime() / 1000))
      .setJti(jti)
      .sign(privateKey);
  }

  /** A token this service signed for `audience`, or null (bad signature, other audience, expired, malformed). */
  async verifyOwnToken(token: string, audience: string): Promise<JWTPayload | null> {
    try {
      const { payload } = await jwtVerify(token, this.jwks, {
        issuer: this.runtime.config.publicBaseUrl,
        audience,
        algorithms: ['EdDSA'],
      });
      return payload;
    } catch {
      return null;
    }
  }
}
