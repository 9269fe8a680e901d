import { Type, type Static } from 'typebox';
import { fromStoredJson } from '../../domain/client-json.ts';
import type { AgentDoc, AgentKeyDoc } from '../../store/agents.ts';
import { AgentId, Timestamp } from './common.ts';

const NAMESPACE = Type.String({ pattern: '^[a-z0-9][a-z0-9._-]{0,63}$' });
const KEY_ID = Type.String({ pattern: '^key_[0-9a-f]{24}$' });
// 32 key bytes in base64: the last character carries 2 bits, so only these 16 end a canonical encoding.
const KEY_BYTES_B64URL = '[A-Za-z0-9_-]{42}[AEIMQUYcgkosw048]';
const KEY_BYTES_B64 = '[A-Za-z0-9+/]{42}[AEIMQUYcgkosw048]=';
/** The SPKI DER prefix of every Ed25519 public key (RFC 8410), in base64. */
const ED25519_SPKI_PREFIX_B64 = 'MCowBQYDK2VwAyEA';
const PublicKey = Type.String({
  pattern: `^(${KEY_BYTES_B64URL}|-----BEGIN PUBLIC KEY-----\r?\n${ED25519_SPKI_PREFIX_B64}${KEY_BYTES_B64}\r?\n-----END PUBLIC KEY-----(\r?\n)?)$`,
  description: 'Ed25519 public key: SPKI PEM, or base64url of the raw 32 bytes',
});

const agentFields = {
  publicKey: PublicKey,
  displayName: Type.Optional(Type.String({ maxLength: 200 })),
  metadata: Type.Optional(
    Type.Record(Type.String(), Type.Unknown(), {
      propertyNames: { maxLength: 256 },
      maxProperties: 50,
      description: 'any JSON object (at most 50 keys, nested at most 128 deep); returned exactly as sent',
    }),
  ),
};
/** An agent id given whole, or made from namespace and name (each defaulted), never both. */
export const RegisterAgent = Type.Union(
  [
    Type.Object({ agentId: AgentId, ...agentFields }, { additionalProperties: false }),
    Type.Object(
      {
        namespace: Type.Optional(NAMESPACE),
        name: Type.Optional(Type.String({ pattern: '^[A-Za-z0-9._-]{1,128}$' })),
        ...agentFields,
      },
      { additionalProperties: false },
    ),
  ],
  {
    examples: [
      {
        agentId: 'acme:agent:summarizer',
        publicKey: 'u5jlaizlZFrJIj9vQZISq1AqnPx_OTCSPTQVISUxia0',
        displayName: 'Summarizer',
        metadata: { model: 'gpt-4o-mini', team: 'research' },
      },
    ],
  },
);
export const Registered = Type.Object({
  agentId: Type.String(),
  keyId: Type.String(),
  status: Type.Literal('active'),
  createdAt: Timestamp,
});
export const AgentKey = Type.Object({
  keyId: Type.String(),
  publicKey: Type.String({ description: 'base64url of the raw 32-byte key' }),
  status: Type.Union([Type.Literal('active'), Type.Literal('revoked')]),
  createdAt: Timestamp,
  revokedAt: Type.Union([Timestamp, Type.Null()]),
});
export const AgentKeyOfAgent = Type.Intersect([Type.Object({ agentId: Type.String() }), AgentKey]);
export const Agent = Type.Object({
  agentId: Type.String(),
  displayName: Type.Union([Type.String(), Type.Null()]),
  metadata: Type.Union([Type.Record(Type.String(), Type.Unknown()), Type.Null()]),
  status: Type.String(),
  keys: Type.Array(AgentKey),
  createdAt: Timestamp,
});
export const AgentParams = Type.Object({ agentId: AgentId });
export const KeyParams = Type.Object({ agentId: AgentId, keyId: KEY_ID });
export const AddKey = Type.Object(
  { publicKey: PublicKey },
  { additionalProperties: false, examples: [{ publicKey: 'u5jlaizlZFrJIj9vQZISq1AqnPx_OTCSPTQVISUxia0' }] },
);

export function keyView(k: AgentKeyDoc): Static<typeof AgentKey> {
  return {
    keyId: k.keyId,
    publicKey: k.publicKey,
    status: k.status,
    createdAt: k.createdAt.toISOString(),
    revokedAt: k.revokedAt?.toISOString() ?? null,
  };
}

export function agentView(a: AgentDoc): Static<typeof Agent> {
  return {
    agentId: a._id,
    displayName: a.displayName,
    metadata: a.metadataJson === null ? null : fromStoredJson<Record<string, unknown>>(a.metadataJson),
    status: a.status,
    keys: Object.values(a.keys)
      .sort((x, y) => x.createdAt.getTime() - y.createdAt.getTime())
      .map(keyView),
    createdAt: a.createdAt.toISOString(),
  };
}
