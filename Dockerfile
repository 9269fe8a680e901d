# Production image: the service runs as compiled JavaScript (`node dist/main.js`), not through a TypeScript loader.
FROM node:20-slim AS build
WORKDIR /app
# The client package is an npm workspace: npm ci links it, `npm run build` compiles it first, then the service.
COPY package.json package-lock.json ./
COPY packages/client/package.json ./packages/client/
RUN npm ci --no-audit --no-fund
COPY tsconfig.json tsconfig.build.json ./
COPY packages/client ./packages/client
COPY src ./src
RUN npm run build

FROM node:20-slim
WORKDIR /app
COPY package.json package-lock.json ./
COPY packages/client/package.json ./packages/client/
RUN npm ci --omit=dev --no-audit --no-fund
COPY --from=build /app/packages/client/dist ./packages/client/dist
COPY --from=build /app/dist ./dist
COPY bin ./bin
COPY src ./src
COPY openapi ./openapi
ENV NODE_ENV=production HOST=0.0.0.0 PORT=3000
USER node
# A young generation of 8 MB a semi-space (16 by default), and an old generation allowed to grow to 1.5x what the
# last full GC kept (V8 lets it reach 2-4x), keep peak RSS under load down; without allocation-site pretenuring a
# burst of load cannot leave per-request objects allocated straight into the old generation (docs/performance.md).
ENTRYPOINT ["node", "--max-semi-space-size=8", "--heap-growing-percent=50", "--no-allocation-site-pretenuring", "dist/main.js"]
CMD ["api"]
