// Drives a streamed create with openai-node, the way an app does, and prints what it saw as one
// JSON line: the event types in order and the final Response's id and status.
// Usage: node responses_sse.mjs <base_url> <api_key> <model> <input>
import OpenAI from 'openai';

const [baseURL, apiKey, model, input] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0 });

// The raw event iterator: it stops at `data: [DONE]`, throws on any other non-JSON data line.
const stream = await client.responses.create({ model, input, stream: true });
const types = [];
for await (const event of stream) types.push(event.type);

// The accumulating helper: strict about event order, resolves with the final Response.
const final = await client.responses.stream({ model, input }).finalResponse();

console.log(JSON.stringify({ types, final: { id: final.id, status: final.status } }));
