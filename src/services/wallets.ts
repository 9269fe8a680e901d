import { newId } from '../domain/crypto.ts';
import { errors, ServiceError } from '../domain/errors.ts';
import type { Runtime } from '../runtime.ts';
import type { Balances, PostingDoc, WalletDoc } from '../store/ledger.ts';

export interface WalletState {
  wallet: WalletDoc;
  balances: Balances;
}

export interface CreditInput {
  walletId: string;
  amount: number;
  currency: string;
  /** Owner of a new sponsor wallet; an agent's wallet always belongs to the agent's tenant. */
  tenantId?: string;
  /** External reference: crediting the same reference twice credits once. */
  reference?: string;
}

/**
 * The credit's entry id, one per wallet and reference. Wallet ids (an agent's among them) and references may both
 * contain ':', so `credit:<wallet>:<reference>` alone is ambiguous ('a:b' + 'c' and 'a' + 'b:c' meet). That form is
 * kept for a colon-free reference (its last ':' then splits it one way only, and every id made before stays the
 * same); a reference with a ':' gets the wallet id length-prefixed instead.
 */
export function creditEntryId(walletId: string, reference: string): string {
  return reference.includes(':')
    ? `credit~${walletId.length}~${walletId}:${reference}`
    : `credit:${walletId}:${reference}`;
}

/**
 * Ops funding: credits a wallet, creating it first if needed (an agent id names the agent's wallet; any other id a
 * sponsor wallet of an existing tenant). The entry id derives from the reference, so a repeat credits once; the
 * same reference with another amount or currency is refused.
 */
export async function creditWallet(runtime: Runtime, input: CreditInput): Promise<WalletState & { entryId: string }> {
  const { agents, ledger, tenants } = runtime.stores;
  const { walletId, amount, currency, reference } = input;
  const agent = await agents.getAny(walletId);
  let wallet = await ledger.getWallet(walletId);
  if (!wallet) {
    const tenantId = agent?.tenantId ?? input.tenantId;
    if (!tenantId)
      throw errors.unprocessable('a new sponsor wallet needs tenantId', {
        errors: [{ path: 'body.tenantId', message: 'required for a new sponsor wallet' }],
      });
    if (!agent && !(await tenants.get(tenantId))) throw errors.notFound('tenant');
    wallet = await ledger.ensureWallet(walletId, tenantId, agent ? 'agent' : 'sponsor');
  }
  const entryId = creditEntryId(walletId, reference ?? newId('crd'));
  try {
    await ledger.apply({
      _id: entryId,
      tenantId: wallet.tenantId,
      kind: 'credit',
      currency,
      legs: [{ walletId, bucket: 'available', delta: amount }],
      ref: { walletId },
    });
  } catch (err) {
    // The ledger refuses an entry id asked for another movement: here, a reference reused with another amount.
    if (err instanceof ServiceError && err.code === 'TRANSITION_ILLEGAL') {
      throw errors.conflict('TRANSITION_ILLEGAL', `reference ${reference} was already used for another credit`, {
        status: 'applied',
      });
    }
    throw err;
  }
  return { wallet, balances: await ledger.balances(walletId), entryId };
}

/** The wallet of this tenant; another tenant's wallet is not found, like one that does not exist. */
async function walletOf(runtime: Runtime, tenantId: string, walletId: string): Promise<WalletDoc> {
  const wallet = await runtime.stores.ledger.getWallet(walletId);
  if (!wallet || wallet.tenantId !== tenantId) throw errors.notFound('wallet');
  return wallet;
}

export async function getWallet(runtime: Runtime, tenantId: string, walletId: string): Promise<WalletState> {
  const wallet = await walletOf(runtime, tenantId, walletId);
  return { wallet, balances: await runtime.stores.ledger.balances(wallet._id) };
}

/** A page of the wallet's balance changes, newest first; `cursor` is the previous page's `nextCursor`. */
export async function listWalletEntries(
  runtime: Runtime,
  tenantId: string,
  walletId: string,
  page: { limit: number; cursor?: string },
): Promise<{ items: PostingDoc[]; nextCursor: string | null }> {
  const wallet = await walletOf(runtime, tenantId, walletId);
  const listed = await runtime.stores.ledger.listPostings(wallet._id, page.limit, page.cursor);
  if (!listed)
    throw errors.unprocessable('cursor is not one this API issued', {
      errors: [{ path: 'querystring.cursor', message: 'invalid' }],
    });
  return listed;
}
