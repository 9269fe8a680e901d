// Package entry: what a receiver of this service's webhooks imports.
export {
  verifyWebhook,
  WebhookVerificationError,
  type VerifyWebhookOptions,
  type WebhookEvent,
  type WebhookHeaders,
  type WebhookSecret,
  type WebhookVerificationErrorCode,
} from './webhooks/verify.ts';
