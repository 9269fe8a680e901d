// express 5 ships no types and @types/express is not a dependency of this project: the little the example uses.
declare module 'express' {
  import type { IncomingMessage, Server, ServerResponse } from 'node:http';
  export interface Request extends IncomingMessage {
    query: Record<string, unknown>;
    originalUrl: string;
    protocol: string;
  }
  export interface Response extends ServerResponse {
    json(body: unknown): this;
  }
  export type NextFunction = (err?: unknown) => void;
  export type Handler = (req: Request, res: Response, next: NextFunction) => void | Promise<void>;
  export interface Express {
    (req: IncomingMessage, res: ServerResponse): void;
    use(handler: Handler): this;
    get(path: string, handler: Handler): this;
    listen(port: number, host: string, callback?: () => void): Server;
  }
  export default function express(): Express;
}
