import { Type } from 'typebox';

/** A JSON-RPC 2.0 message as MCP sends them; the MCP SDK validates the rest. */
const JsonRpcMessage = Type.Object(
  {
    jsonrpc: Type.Literal('2.0'),
    id: Type.Optional(Type.Union([Type.String(), Type.Integer(), Type.Null()])),
    method: Type.Optional(Type.String({ description: 'initialize, tools/list, tools/call, notifications/…' })),
    params: Type.Optional(Type.Record(Type.String(), Type.Unknown())),
    result: Type.Optional(Type.Unknown()),
    error: Type.Optional(Type.Unknown()),
  },
  { additionalProperties: false },
);

export const McpRequestBody = Type.Union([JsonRpcMessage, Type.Array(JsonRpcMessage, { minItems: 1 })], {
  description: 'One JSON-RPC message or a batch (MCP Streamable HTTP, stateless: no Mcp-Session-Id)',
  examples: [{ jsonrpc: '2.0', id: 1, method: 'tools/call', params: { name: 'whoami', arguments: {} } }],
});

export const McpResponseBody = Type.Union([JsonRpcMessage, Type.Array(JsonRpcMessage)], {
  description:
    "The JSON-RPC response(s); a tool that failed answers a result with isError and the service's error code",
});
