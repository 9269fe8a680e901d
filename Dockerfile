FROM node:20-slim
WORKDIR /app
COPY package.json package-lock.json ./
RUN npm ci --omit=dev --no-audit --no-fund
COPY src ./src
COPY bin ./bin
COPY openapi ./openapi
ENV NODE_ENV=production HOST=0.0.0.0 PORT=3000
USER node
ENTRYPOINT ["node", "--import", "tsx", "src/main.ts"]
CMD ["api"]
