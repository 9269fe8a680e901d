import { Type } from 'typebox';

export const WhoAmI = Type.Object({
  tenantId: Type.String(),
  keyId: Type.String(),
  scopes: Type.Array(Type.String()),
});
